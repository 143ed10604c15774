"""The email backend of development (DEBUG on, no EMAIL_HOST): Django's console backend,
printing each email as a person reads it.

Django writes a text part whose lines are longer than 78 characters as quoted-printable, as
mail must travel. Printed so, the review link is cut by soft line breaks (a "=" at the end of
a line) and its "=" written "=3D": it can be neither clicked nor copied from the console. Here
the same email is printed with lines allowed up to 998 characters (the most a line of mail may
hold, RFC 5322) and in UTF-8, so its parts are written 7bit or 8bit, as they were written,
headers too. Only the printing differs: an SMTP server is sent what Django writes."""

from __future__ import annotations

import email.policy

from django.core.mail import EmailMessage
from django.core.mail.backends import console

READABLE = email.policy.default.clone(max_line_length=998, utf8=True)


class EmailBackend(console.EmailBackend):
    def write_message(self, message: EmailMessage) -> None:
        printed = message.message(policy=READABLE).as_bytes().decode()
        self.stream.write(f"{printed}\n{'-' * 79}\n")
