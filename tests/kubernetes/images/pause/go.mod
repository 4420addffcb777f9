module keelson.local/pause

go 1.24
