"""Console views."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Landing page for signed-in staff; the live console will replace it."""
    return render(request, "home.html")
