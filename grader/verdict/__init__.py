"""The verdict: a check decided from data alone (outputs, facts, a kernelsim trace) against the
course's stored references; it runs no process and reads no file but those references."""
