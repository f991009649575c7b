"""The user's loader described and rebuilt: its Settings and LoaderSpec, the Workload, the thread loader, and the
datasets' wrappers."""
