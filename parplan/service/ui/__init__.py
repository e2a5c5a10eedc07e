"""The ops dashboard at ``/ui``: static pages and plain JavaScript (no build step, no CDN) that
call the ``/v1`` API with the token the browser keeps in ``sessionStorage``."""
