module keelson.local/echo

go 1.24
