"""The web portal: static assets served by the API process; it talks only to the REST API."""
