"""The ranks' environment: presets, the user's .deepspeed_env, the rendered env file."""
