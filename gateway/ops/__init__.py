"""What keeps a serving process observable and healthy: logs, metrics, traces, outages, reload, housekeeping."""
