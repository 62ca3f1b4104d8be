"""A real local Slurm cluster (slurmctld + one slurmd per fake node) for development and tests."""
