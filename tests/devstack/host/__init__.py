"""Tests of devstack.host, the local stand-in for the Functions host."""
