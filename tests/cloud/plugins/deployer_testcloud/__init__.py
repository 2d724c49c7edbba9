"""Plugins of the test cloud: an ML2 mechanism driver that binds ports with no agent,
and Nova's fake virt driver with a GPU-like child resource provider."""
