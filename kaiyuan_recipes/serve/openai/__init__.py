"""OpenAI's completions contract: `POST /v1/completions` (streaming too) and `GET /v1/models`."""
