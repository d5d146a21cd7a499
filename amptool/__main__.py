from amptool.cli.main import main

main()
