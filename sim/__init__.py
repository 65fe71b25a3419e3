"""Deterministic simulation of the whole system from a seed (issue 11): the
product's own code against in-memory worlds with faults drawn from the seed."""
