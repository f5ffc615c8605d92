"""The server's HTTP routes, one APIRouter per concept; build_app (server/api.py) includes
them. Handlers read the server's state from `request.app.state.tm` (a ServerState).

    health.py     /health, /version, /metrics
    openai.py     /v1/models, /v1/chat/completions, /v1/completions
    tokenize.py   /tokenize, /detokenize, /tokenizer_info
    admin.py      /reset_prefix_cache, /kv_cache, /kv_cache/digests, /server_info

The Responses API (server/responses/routes.py), files and batches (server/batch/routes.py,
server/batch/file_routes.py) and the UI's data (ui/routes.py) have their own routers."""
