"""Adapters: the only code that imports Azure SDKs. Each translates SDK errors
into the domain's vocabulary (domain.errors) at its boundary."""
