from django.db import models


class Signup(models.Model):
    """Someone who signed up on the demo page and gets a welcome email."""

    email = models.EmailField(unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.email
