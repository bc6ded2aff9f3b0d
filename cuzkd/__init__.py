"""cuzkd: supervisor, Prometheus exporter and reference engine for GPU SNARK provers."""

__version__ = "0.1.0"
