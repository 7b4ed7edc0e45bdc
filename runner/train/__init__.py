"""Code that runs inside each rank: data, model, engines. Entry point: `python -m runner.train`."""
