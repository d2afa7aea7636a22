"""Launch: the job's options, the sbatch script, submission, following a job, Kubernetes."""
