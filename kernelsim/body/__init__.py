"""The kernel body interpreted at every grid step: its ref accesses and its own DMAs as events,
computing only the values that decide them."""
