"""Recipe files (YAML run specs) and the embedded default assets, shipped with the package."""
