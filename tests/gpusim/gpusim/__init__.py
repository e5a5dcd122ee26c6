"""gpusim: a simulated GPU node for tests and the demo."""
