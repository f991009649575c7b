"""The user's loader described and rebuilt: its Settings and LoaderSpec, its facts, the Workload, the thread loader,
the datasets' wrappers, and the DDP plan's arithmetic."""
