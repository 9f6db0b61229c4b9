"""What stays in memory: page-cache residency telemetry for the expert store."""
