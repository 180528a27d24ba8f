"""Running jobs: runner slots and their queues, leases and attempts, script execution, warm
python workers, presence, and the external runner protocol."""
