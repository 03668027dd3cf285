"""`kaiyuan data clean`: deduplication and quality filtering of parquet corpora with datatrove, between download and
blend. config.py reads the declarative YAML (recipes/cleaning/), inputs.py checks the input files before anything
runs, steps.py holds the thin datatrove adapters, pipeline.py assembles datatrove's stages, executors.py runs them
(locally or on Slurm) and manifest.py records what each step removed."""
