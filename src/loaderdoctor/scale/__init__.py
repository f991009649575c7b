"""scale: the loader under DDP ranks, started through torch.distributed's elastic launcher, and the DDP plan."""
