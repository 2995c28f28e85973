"""Analysis pipeline: event logs of a run -> metrics, verdicts (summary.json) and report.html (EVENTS.md)."""
