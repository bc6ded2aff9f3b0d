"""The exporter: one plain ``SupervisorSample`` per scrape turned into Prometheus families."""
