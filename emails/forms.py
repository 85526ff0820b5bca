from django import forms

from emails.models import Signup


class SignupForm(forms.ModelForm):
    """Email address plus a demo switch that makes the email task flaky."""

    make_it_fail = forms.BooleanField(
        required=False,
        label="Make it fail sometimes",
        help_text="The task then fails half of the time, so you can watch the retries.",
    )

    class Meta:
        model = Signup
        fields = ["email"]

    @property
    def fail_rate(self) -> float:
        return 0.5 if self.cleaned_data.get("make_it_fail") else 0.0
