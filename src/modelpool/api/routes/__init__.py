"""HTTP routes: validate → call the runtime → render. Nothing else."""
