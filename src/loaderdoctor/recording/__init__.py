"""The Recording of a measured run and every reading of it: rates, what loading used, the limit, what an epoch
costs."""
