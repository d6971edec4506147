from draftgen.cli import app

app(prog_name="draftgen")
