from signalbox.cli.main import app

app(prog_name="signalbox")
