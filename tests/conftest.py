"""Shared pytest configuration: every test under tests/ can use the gpusim fixtures."""

pytest_plugins = ["gpusim.pytest_plugin"]
