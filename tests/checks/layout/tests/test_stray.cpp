// planted: a test outside its group
