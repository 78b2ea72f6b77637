"""The weight-format registry: one module per format."""
