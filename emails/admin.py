from django.contrib import admin

from emails.models import Signup


@admin.register(Signup)
class SignupAdmin(admin.ModelAdmin):
    list_display = ["email", "created_at"]
    search_fields = ["email"]
