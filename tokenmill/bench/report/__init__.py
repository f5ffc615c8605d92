"""Reports: console and markdown tables, JSON/CSV files, PNG plots, an HTML page."""
