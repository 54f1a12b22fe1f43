"""The node's history: a state directory whose episodes, counters and GPU identities
survive restarts and reboots (docs/history.md)."""
