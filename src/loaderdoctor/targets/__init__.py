"""TARGET to the user's loaders: importing a module or file, calling its function within a time limit, a
LightningDataModule's loaders."""
