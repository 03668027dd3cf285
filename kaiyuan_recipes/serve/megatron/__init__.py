"""Megatron's text-generation contract: `PUT /api`, the request fields and response shape of Megatron's server."""
