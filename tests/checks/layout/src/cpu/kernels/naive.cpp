// planted kernel naive
