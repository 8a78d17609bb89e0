"""Run recipes shipped with patchword (YAML files read by ``patchword.run_config.recipe_path``)."""
