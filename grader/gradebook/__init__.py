"""The gradebook: what a grade becomes once decided: the late penalty, the feedback pages a
learner reads, and the roster's names and e-mails the exports carry."""
