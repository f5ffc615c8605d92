"""OpenAI's Responses API (/v1/responses) and its store. Routes: routes.add_response_routes."""
