"""The device: the agent loop with its two-way ledger and duty-cycle pacing, its model
replica, the answers it sends and how it reads the job's settings."""
