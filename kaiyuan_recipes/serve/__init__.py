"""`kaiyuan serve`: one batching generation engine (engine.py) under two HTTP contracts, one folder each:
OpenAI's completions (openai/) and Megatron's text-generation `PUT /api` (megatron/), each an api_router (the
routes), a protocol (the pydantic request and response) and a serving module (requests to the engine and its
answers back)."""
