"""What several diagnose rooms share: the dead-engine rule (watchdog and log doctor), /proc readers
(hang and watchdog), the root-cause order of recorded rank errors (hang and log doctor), counted nouns,
and the CLI helpers of the diagnose commands. Pure or read-only; imports no room."""
