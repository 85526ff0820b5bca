"""Demo app: a signup form whose welcome email is sent by a Chasqui task."""
