"""Loopback fakes of remote services (Sail) for tests and benchmarks. No network, no keys."""
