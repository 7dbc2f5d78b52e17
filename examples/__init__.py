"""Example retrytopics applications (used by docker-compose.yml)."""
