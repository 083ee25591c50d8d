"""What every resumable stage run shares: run state and exact resume, the step log, the run-directory lock and the
CLI arguments and error handling of every `minite` command."""
