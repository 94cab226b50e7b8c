"""Business logic behind the API and the control loops. Routers stay thin and call these."""
