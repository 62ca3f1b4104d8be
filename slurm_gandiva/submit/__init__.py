"""Submission: `gandiva sbatch` (cli), request parsing/validation, the job script, and the spec contract."""
