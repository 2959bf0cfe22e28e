"""Definitions, jobs, schedules and sensors."""
