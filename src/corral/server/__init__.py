"""The server process: the API (uvicorn) plus leased background control loops."""
