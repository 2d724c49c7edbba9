"""deployer: a GPU training cluster as code, and proof of how fast it is."""

__version__ = "0.1.0"
